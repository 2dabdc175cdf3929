"""The ML: question and passage towers, training, hard-negative mining, metrics.

Imports nothing from the project's other packages. torch and sentence-transformers are imported lazily.
"""
