"""edge_client."""
