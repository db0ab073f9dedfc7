"""The F-beta S-measure regularizer by Lagrangian reparameterization (spec sec. 1-3b, 6)."""
