"""The shared core every route goes through: auth, upstream, relay, the request's life to its record."""
