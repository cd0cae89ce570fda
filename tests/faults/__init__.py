"""The fault suite: services in their own processes talk to a real Redis through a TCP proxy that breaks
connections, while Redis and the processes are killed and restarted; the end state is checked against ground
truth kept in SQLite."""
