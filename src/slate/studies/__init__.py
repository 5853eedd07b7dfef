"""Studies built on ordinary ``slate train`` runs (``slate reproduce communication``), beside the
library rather than in it: the library never imports them."""
