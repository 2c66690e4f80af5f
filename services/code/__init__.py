"""Code that travels with a job: packing a submit directory (client), uploading it, unpacking it (agent)."""
