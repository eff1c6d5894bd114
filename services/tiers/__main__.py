"""`python -m services.tiers`: one tier node (settings from CACHEMESH_TIERS_*, KAFKA_*, DATABASE_URL)."""

from services.runtime.service import run_service
from services.tiers.service import TiersService
from services.tiers.settings import TiersSettings

if __name__ == "__main__":
    run_service(lambda: TiersService(TiersSettings()))
