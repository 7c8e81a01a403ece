"""hamidsim: the simulator that ships beside hamid, never inside it (stand-ins and the demo)."""
