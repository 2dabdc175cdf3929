"""The training lab: recipes, mining, pairs, metrics. Never on the query or ingest path (the towers, the registry
and the ONNX export are in encoders/ itself).
"""
