from __future__ import annotations

from typing import ClassVar

from base_task import Context, Item, Outputs, Params, endpoint
from tests.testsite import base_url


class ReviewsParams(Params):
    entry_id: str
    page: int = 1
    delay: float = 0.0


class Review(Item):
    item_type: ClassVar[str] = "testsite.review"
    key_fields: ClassVar[tuple[str, ...]] = ("review_id",)
    review_id: str
    entry_id: str
    text: str


@endpoint(ReviewsParams, items=[Review], name="testsite.local.reviews")
def reviews(ctx: Context, p: ReviewsParams) -> Outputs:
    q = {"page": p.page, "delay": p.delay}
    data = ctx.get(f"{base_url()}/reviews/{p.entry_id}", params=q).json()
    for r in data["reviews"]:
        yield Review(review_id=r["id"], entry_id=p.entry_id, text=r["text"])
    if data["next"]:
        yield ctx.follow(page=data["next"])
