"""The upgrade tests: release 0.1.0 (from its git tag) and this checkout side by side, with transactions in flight."""
