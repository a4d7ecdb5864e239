"""The FIM ("fill in the middle") completion family, `POST /beta/completions`: its wire model, the F-rules,
the stream meter and the family adapter. Built on the OpenAI family's wire pieces (same error shape)."""
