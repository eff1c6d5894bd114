"""`python -m streams`: the faust worker as a service, configured from the environment (see
`StreamsSettings`); creates its topics first and runs until SIGINT/SIGTERM."""

from services.runtime.service import run_service
from streams.service import StreamsService
from streams.settings import StreamsSettings

if __name__ == "__main__":
    run_service(lambda: StreamsService(StreamsSettings()))
