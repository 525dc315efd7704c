"""Protocol adapters onto the dispatcher: they translate other protocols and carry no semantics of their own."""
