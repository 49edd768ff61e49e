"""A mutant named by $HETRAIN_MUTANT (hetrain.testing.mutants) applies to the test process too, so
the tests that run in-process (codecs, weights, the resume check) see it as the workers do."""

from hetrain.testing.mutants import apply_from_env


def pytest_configure(config):
    apply_from_env()
