"""The service's routes: each module a group of REST routes (``routes``), the pages,
the OpenAPI document, and what every route shares to read a request (its body, its
query arguments). Routes check who is asking, then call a manager; no state lives here."""
