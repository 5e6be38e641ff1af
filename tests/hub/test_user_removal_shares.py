"""What deleting a hub user asks of the service about sharing (hub_ext.user_removal):
endpoints and collections are shared by name, so the name comes off every share list
and the user's collections go (a later user given the name gets none of them). The
collections' side runs on the real service in tests/vectors/test_collections_api.py."""

from gpulab.hub_ext.user_removal import forget_shares


class Recorder:
    """The service as the hub's client sees it: the listings, and what was asked."""

    def __init__(self, collections, deployments):
        self.lists = {"/collections": collections, "/deployments": deployments}
        self.asked = []

    async def request(self, method, path, body=None, query=None):
        if method == "GET":
            return self.lists[path]
        self.asked.append((method, path, query, body))
        return {}


async def test_the_name_leaves_every_share_list_and_its_collections_go():
    service = Recorder(
        collections=[
            {"owner": "alice", "name": "docs", "share_users": ["bob", "carol"]},
            {"owner": "bob", "name": "notes", "share_users": ["alice"]},
            {"owner": "dave", "name": "x", "share_users": ["bobby"]},
        ],
        deployments=[
            {"user": "alice", "name": "chat", "share_users": ["carol", "bob"]},
            {"user": "dave", "name": "mlp", "share_users": ["bobby"]},
        ],
    )
    await forget_shares(service, "bob")
    assert service.asked == [
        ("PATCH", "/collections/alice/docs", None, {"share_users": ["carol"]}),
        ("DELETE", "/collections/bob/notes", None, None),
        ("PATCH", "/deployments/chat", {"user": "alice"}, {"share_users": ["carol"]}),
    ]
