"""Reflect's streaming runtime, grouped by role (streams/README.md): the worker
(`worker/`), the HTTP API it serves (`http/`), the public client (`client/`), the
command line (`cli/`), the adapters behind the cores' ports (`adapters/`), and at
the top what they all share: settings, the broker and its topics, publishing,
security, tokens, crypto-shredding's keys."""
