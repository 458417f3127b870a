"""Settings for the whole test suite.

Hypothesis: no per-example deadline and no "too slow" health check. CI machines are
shared and their load varies, so wall time per example says nothing about correctness.
Performance is measured by the benchmarks under bench/, not by tests.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("modstage", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("modstage")
