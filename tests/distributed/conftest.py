"""A small local Ray cluster (2 CPUs) shared by the distributed tests of one module; always shut down."""
import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
