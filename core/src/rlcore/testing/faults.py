"""The fault-injection harness the tests share, under the name tests import.

The injector runs in the driver (a run started with ``RLCORE_FAULTS`` set builds it), so it
lives in :mod:`rlcore.trainer.faults`; this module only names it for tests and plugin authors.
"""

from rlcore.trainer.faults import FAULTS_ENV, Fault, FaultInjector, fault_env, parse_faults

__all__ = ["FAULTS_ENV", "Fault", "FaultInjector", "fault_env", "parse_faults"]
