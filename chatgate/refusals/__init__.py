"""The refusal inspector: the last refused requests (chatgate's own 400s and DeepSeek's 4xx it forwarded),
redacted, kept in the store for every replica (`chatgate refusals`, `/admin/refusals`, the dashboard)."""
