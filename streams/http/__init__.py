"""The HTTP API a worker serves: the routes, one module per resource (`routes/`,
re-exported by `api`), and the signed forwarding of a read to the worker that
owns its user (`forwarding`)."""
