"""Android foreground service "Sensing" (buildozer.spec ``services``): runs edge_client.app.service."""

from edge_client.app.service import run_service

run_service()
