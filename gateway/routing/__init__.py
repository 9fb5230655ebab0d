"""Which model server takes a reply, or a refusal: the rule (`admission`, pure) and the pool of
servers it is applied to (`pool`), which joins one part per job: `discovery` (the servers the
URLs name), `probes` (their load and readiness), `waiting` (replies waiting for spare time) and
`placement` (a reply's place on a server, and its failover)."""
