"""DeepSeek's tool APIs (`/v1/tools/search`, `fetch`, `ocr`, `tts`, `asr`) as a family of the gateway: their
rules (T1-T8, docs/rules-tools.md), the multipart bodies of the uploads, and what an answer is billed for."""
