"""python -m services.invalidation: run the invalidation service with settings from the environment."""

from services.invalidation.service import InvalidationService
from services.invalidation.settings import InvalidationSettings
from services.runtime.service import run_service

if __name__ == "__main__":
    run_service(lambda: InvalidationService(InvalidationSettings()))
