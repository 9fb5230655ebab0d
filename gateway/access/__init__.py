"""Who may use the gateway: API keys and tokens (`keys`), which routes need what (`policy`, pure),
its ASGI edge and request log (`middleware`), and sessions and per-minute rates (`quotas`)."""
