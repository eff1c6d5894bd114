"""python -m services.bridge: run the vLLM KV-event bridge with settings from the environment."""

from services.bridge.service import BridgeService
from services.bridge.settings import BridgeSettings
from services.runtime.service import run_service

if __name__ == "__main__":
    run_service(lambda: BridgeService(BridgeSettings()))
