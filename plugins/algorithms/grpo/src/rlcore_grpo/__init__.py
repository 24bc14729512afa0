"""GRPO and REINFORCE++ for rlcore. The algorithms live in :mod:`rlcore_grpo.algorithm`
(imports torch); this package stays empty so that plugin discovery is light."""
