"""Hibernation: an idle server's kernels saved to the user's own files, the server
stopped and its slice given back; starting it again brings each kernel's variables
back (:mod:`.manager`; the calls into a user's server, :mod:`.servers`)."""
