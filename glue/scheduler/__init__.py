"""Job schedulers a cluster may run (`glue up --scheduler`): what glue asks of them from the controller."""
