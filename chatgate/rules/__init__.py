"""The rules kernel every API family's checks stand on: a rule's type, running a family's rules, the order
problems are listed in, range checks, the validation options, the models DeepSeek serves (and the refusal
of one it does not), and the catalogue of every rule with its certainty and as-of date. A family's package
holds only its rules (chatgate/openai/rules.py, chatgate/anthropic/rules.py, …)."""
