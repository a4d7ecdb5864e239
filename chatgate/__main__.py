from chatgate.cli import main

raise SystemExit(main())
