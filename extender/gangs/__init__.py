"""Gang scheduling: where gangs come from, and the plan-reserve-permit-bind cycle."""
