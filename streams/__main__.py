"""`python -m streams`: the faust worker as a service, configured from the environment (see
`StreamsSettings`); creates its topics first and runs until SIGINT/SIGTERM."""

import gc

from services.runtime.service import run_service
from streams.service import StreamsService
from streams.settings import StreamsSettings


def _service() -> StreamsService:
    settings = StreamsSettings()
    # Process-wide, so here and not in the service's library code (tests run services in one process).
    if settings.gc_threshold:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(settings.gc_threshold, older, oldest)
    return StreamsService(settings)


if __name__ == "__main__":
    run_service(_service)
