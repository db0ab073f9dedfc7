"""Re-runnable, deterministic builders that turn raw data into the caches ``train.caches`` reads.

Part of the application (runs from the checkout, not installed). Importing it has no side effects.
"""
