"""The bottom layer of services: errors, settings, file and lock helpers, the data dir's format and free space.
Imports nothing else of services.
"""
