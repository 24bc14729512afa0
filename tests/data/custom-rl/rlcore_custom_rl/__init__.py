"""A third-party policy loss and advantage estimator for rlcore's tests: the functions live in
:mod:`rlcore_custom_rl.rl` (imports torch); this package and its plugin module stay light."""
