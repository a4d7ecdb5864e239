"""The HTTP face: the app factory, routes, /metrics, /admin and the dashboard."""
