"""python -m services.heat: run the heat service with settings from the environment."""

from services.heat.service import HeatService
from services.heat.settings import HeatSettings
from services.runtime.service import run_service

if __name__ == "__main__":
    run_service(lambda: HeatService(HeatSettings()))
