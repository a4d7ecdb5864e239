"""OpenTelemetry traces (OTLP): one SERVER span per API request, one CLIENT span per upstream attempt with
the GenAI semantic conventions. The SDK is imported only when tracing is on (chatgate.tracing.setup)."""
