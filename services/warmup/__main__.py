"""python -m services.warmup: run the warmup service with settings from the environment."""

from services.runtime.service import run_service
from services.warmup.service import WarmupService
from services.warmup.settings import WarmupSettings

if __name__ == "__main__":
    run_service(lambda: WarmupService(WarmupSettings()))
