"""python -m services.heat: run the heat service with settings from the environment."""

from services.heat.service import HeatService
from services.heat.settings import HeatSettings
from services.runtime.service import run_service


def _service() -> HeatService:
    import torch
    from threadpoolctl import threadpool_limits

    settings = HeatSettings()
    # Process-wide, so here and not in the service's library code (tests run services in one process).
    threadpool_limits(settings.threads)
    torch.set_num_threads(settings.threads)
    return HeatService(settings)


if __name__ == "__main__":
    run_service(_service)
