"""glue watch: keeps runs going unattended (automatic verified recovery within budgets)."""
