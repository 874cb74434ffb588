"""Reflect's streaming runtime: settings, topics, the Faust app, the embedded broker, the CLI."""
