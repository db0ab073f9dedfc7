"""Readers of the prepared data caches, one small module per data set (numpy only).

The trainer meets the data builders (``data_prep``) only through the cache format defined here:
``data_prep`` writes what these modules read, and imports their constants; nothing here imports
``data_prep``.
"""
