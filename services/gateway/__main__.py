"""python -m services.gateway: run the OpenAI-compatible gateway with settings from the environment."""

from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from services.runtime.service import run_service

if __name__ == "__main__":
    run_service(lambda: GatewayService(GatewaySettings()))
