"""RLOO for rlcore. The algorithm lives in :mod:`rlcore_rloo.algorithm` (imports torch);
this package stays empty so that plugin discovery (``rlcore_rloo.plugin``) is light."""
