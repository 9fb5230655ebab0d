"""A fleet of gateways sharing one Redis (`--redis-url`): the store and its health
(`store`), the limits counted there (`limits`), cancels that reach the gateway holding the
reply (`cancels`), and what every gateway's replies ask of each model server, for admission
(`asks`)."""
