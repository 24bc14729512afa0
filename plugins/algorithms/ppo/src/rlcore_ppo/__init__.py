"""PPO for rlcore. The algorithm lives in :mod:`rlcore_ppo.algorithm` (imports torch);
this package stays empty so that plugin discovery (``rlcore_ppo.plugin``) is light."""
