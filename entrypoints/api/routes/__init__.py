"""The API's routes, one module per resource; ``entrypoints.api.app`` mounts them."""
