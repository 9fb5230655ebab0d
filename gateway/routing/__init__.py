"""Which model server takes a reply, or a refusal: the rule (`admission`, pure) and the pool of
servers it is applied to (`pool`: discovery, load, reservations, failover)."""
