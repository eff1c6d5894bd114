"""python -m services.dashboard: run the dashboard with settings from the environment."""

from services.dashboard.service import DashboardService
from services.dashboard.settings import DashboardSettings
from services.runtime.service import run_service

if __name__ == "__main__":
    run_service(lambda: DashboardService(DashboardSettings()))
