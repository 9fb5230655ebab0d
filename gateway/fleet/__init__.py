"""A fleet of gateways sharing one Redis (`--redis-url`): the store and its health
(`store`), the limits counted there (`limits`), and cancels that reach the gateway holding
the reply (`cancels`)."""
