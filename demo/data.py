"""The demo platform's data set: deterministic from (seed, sizes) and computed per id on demand.

Nothing is materialised up front, so a server with millions of comments starts instantly and
uses almost no memory, while every crawl sees exactly the same users, posts and comments.

Numbering (all ids are 1-based):
  * users     `u{i}`                          i in 1..U
  * posts     `p{n}`, n = (i-1)*P + k + 1     k in 0..P-1 is the user's k-th post, oldest first
  * comments  `c{m}`, m = (n-1)*C + j + 1     j in 0..C-1 is the post's j-th comment, oldest first
The feed ranks users by a seeded affine permutation and shows each user's newest post;
timestamps are derived from that rank so the feed is also sorted newest first.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from demo.paging import page_count

BASE_TS = 1_735_689_600  # 2025-01-01T00:00:00Z: the newest post of the top-ranked user
RANK_STEP_S = 600  # each feed rank is 10 minutes older than the one above it
POST_STEP_S = 86_400  # a user's posts are one day apart
COMMENT_STEP_S = 37  # comments trickle in after their post

# Default page sizes; `DemoConfig` uses the same values so the two cannot drift apart.
PC_FEED_PAGE_SIZE = 20
PC_USER_PAGE_SIZE = 10
PC_COMMENTS_PAGE_SIZE = 10
H5_FEED_PAGE_SIZE = 20
H5_STATUSES_PAGE_SIZE = 10
H5_COMMENTS_PAGE_SIZE = 20
APP_DEFAULT_SIZE = 20
APP_MAX_SIZE = 50
JS_FEED_PAGE_SIZE = 20
JS_BATCH_SIZE = 5

_FAMILY = [
    ("Wang", "王"), ("Li", "李"), ("Zhang", "张"), ("Liu", "刘"), ("Chen", "陈"),
    ("Yang", "杨"), ("Zhao", "赵"), ("Huang", "黄"), ("Zhou", "周"), ("Wu", "吴"),
    ("Xu", "徐"), ("Sun", "孙"), ("Ma", "马"), ("Zhu", "朱"), ("Hu", "胡"), ("Lin", "林"),
]  # fmt: skip
_GIVEN = [
    ("Wei", "伟"), ("Fang", "芳"), ("Min", "敏"), ("Jing", "静"), ("Lei", "磊"), ("Yang", "洋"),
    ("Yan", "艳"), ("Jun", "军"), ("Tao", "涛"), ("Ming", "明"), ("Chao", "超"), ("Xia", "霞"),
    ("Hui", "慧"), ("Qiang", "强"), ("Lan", "兰"), ("Bo", "波"), ("Ning", "宁"), ("Hao", "浩"),
]  # fmt: skip
_CITIES = [
    "北京 Beijing",
    "上海 Shanghai",
    "广州 Guangzhou",
    "深圳 Shenzhen",
    "杭州 Hangzhou",
    "成都 Chengdu",
    "武汉 Wuhan",
    "西安 Xi'an",
    "南京 Nanjing",
    "重庆 Chongqing",
]
_TOPICS = [
    "科技",
    "财经",
    "体育",
    "娱乐",
    "旅行",
    "美食",
    "教育",
    "健康",
    "汽车",
    "游戏",
    "天气",
    "电影",
    "音乐",
    "房产",
    "历史",
    "军事",
]
_NOUNS = [
    "market",
    "city",
    "team",
    "phone",
    "train",
    "river",
    "festival",
    "startup",
    "museum",
    "school",
    "weather",
    "concert",
    "league",
    "recipe",
    "bridge",
    "policy",
    "robot",
    "garden",
    "airport",
    "library",
]
_ADJS = [
    "new",
    "quiet",
    "busy",
    "bright",
    "surprising",
    "local",
    "rainy",
    "record",
    "late",
    "early",
    "popular",
    "historic",
    "modern",
    "hidden",
    "small",
    "big",
]
_VERBS = [
    "opens",
    "closes",
    "wins",
    "returns",
    "grows",
    "changes",
    "moves",
    "launches",
    "celebrates",
    "slows",
    "rises",
    "falls",
]
_ZH_PHRASES = [
    "今天",
    "据报道",
    "网友表示",
    "记者了解到",
    "值得关注的是",
    "业内人士认为",
    "截至目前",
    "与此同时",
    "专家提醒",
    "有消息称",
]
_ZH_ENDINGS = ["引发热议。", "备受关注。", "令人期待。", "持续升温。", "值得一看。", "众说纷纭。"]
_COMMENTS = [
    "说得好",
    "支持一下",
    "first!",
    "Great point",
    "有道理",
    "不敢相信",
    "me too",
    "学到了",
    "thanks for sharing",
    "哈哈哈",
    "I disagree",
    "同意楼上",
    "Q&A please",
    "期待后续",
    "<not a tag>",
    "太真实了",
]

ZH_COMMA = "\uff0c"  # full-width comma, as Chinese text uses

_ID_RE = {kind: re.compile(rf"{kind}([1-9][0-9]*)") for kind in ("u", "p", "c")}


@dataclass(frozen=True, slots=True)
class User:
    id: str
    name: str
    bio: str
    location: str
    followers: int
    post_count: int
    verified: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "name": self.name,
            "bio": self.bio,
            "location": self.location,
            "followers": self.followers,
            "post_count": self.post_count,
            "verified": self.verified,
        }


@dataclass(frozen=True, slots=True)
class Post:
    id: str
    user_id: str
    title: str
    content: str  # paragraphs separated by "\n"
    likes: int
    comments_count: int
    created_at: int  # unix seconds, UTC

    @property
    def summary(self) -> str:
        """First paragraph: what list views show instead of the full content."""
        return self.content.split("\n", 1)[0]

    def to_summary_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "user_id": self.user_id,
            "title": self.title,
            "summary": self.summary,
            "likes": self.likes,
            "comments_count": self.comments_count,
            "created_at": self.created_at,
        }

    def to_dict(self) -> dict[str, object]:
        d = self.to_summary_dict()
        d["content"] = self.content
        return d


@dataclass(frozen=True, slots=True)
class Comment:
    id: str
    post_id: str
    user_id: str
    user_name: str
    text: str
    likes: int
    created_at: int

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "post_id": self.post_id,
            "user_id": self.user_id,
            "user_name": self.user_name,
            "text": self.text,
            "likes": self.likes,
            "created_at": self.created_at,
        }


def iso(ts: int) -> str:
    """UTC ISO-8601 with a Z suffix, as shown in the pc pages' `datetime` attributes."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(kind: str, ident: str, limit: int) -> int | None:
    m = _ID_RE[kind].fullmatch(ident)
    if m is None:
        return None
    n = int(m.group(1))
    return n if n <= limit else None


def _sentence(rng: random.Random) -> str:
    return (
        f"{rng.choice(_ZH_PHRASES)}{ZH_COMMA}the {rng.choice(_ADJS)} {rng.choice(_NOUNS)} "
        f"{rng.choice(_VERBS)} {rng.choice(['again', 'today', 'at last', 'this week'])}{ZH_COMMA}"
        f"{rng.choice(_TOPICS)}{rng.choice(_ZH_ENDINGS)}"
    )


class Dataset:
    """All users, posts and comments of one (seed, U, P, C); every lookup is O(1)."""

    def __init__(
        self, seed: int = 42, users: int = 20, posts_per_user: int = 5, comments_per_post: int = 5
    ) -> None:
        if users < 0 or posts_per_user < 1 or comments_per_post < 0:
            raise ValueError("need users >= 0, posts_per_user >= 1, comments_per_post >= 0")
        self.seed = seed
        self.users = users
        self.posts_per_user = posts_per_user
        self.comments_per_post = comments_per_post
        # Feed order: user index (0-based) = (a * rank + b) mod U, a coprime to U.
        rng = random.Random(f"{seed}/feed")
        n = max(users, 1)
        a = rng.randrange(1, n + 1)
        while math.gcd(a, n) != 1:
            a += 1
        self._a, self._b = a % n or 1, rng.randrange(n)
        self._a_inv = pow(self._a, -1, n) if n > 1 else 0
        # likes a post has gained since the data set's day (demo/changes.py): post number -> n
        self.likes_gained: Callable[[int], int] | None = None

    # --- sizes ----------------------------------------------------------------------------
    @property
    def total_posts(self) -> int:
        return self.users * self.posts_per_user

    @property
    def total_comments(self) -> int:
        return self.total_posts * self.comments_per_post

    def _rng(self, kind: str, n: int) -> random.Random:
        return random.Random(f"{self.seed}/{kind}/{n}")

    # --- users ----------------------------------------------------------------------------
    def rank_of(self, i: int) -> int:
        """Feed position (0 = top) of user number i."""
        return ((i - 1 - self._b) * self._a_inv) % max(self.users, 1)

    def user_at_rank(self, rank: int) -> int:
        return (self._a * rank + self._b) % self.users + 1

    def user(self, uid: str) -> User | None:
        i = _parse("u", uid, self.users)
        return None if i is None else self._user(i)

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - the dataset lives as long as the server
    def _user(self, i: int) -> User:
        rng = self._rng("user", i)
        fam_py, fam_zh = rng.choice(_FAMILY)
        giv_py, giv_zh = rng.choice(_GIVEN)
        topics = rng.sample(_TOPICS, 2)
        return User(
            id=f"u{i}",
            name=f"{giv_py} {fam_py} {fam_zh}{giv_zh}",
            bio=f"关注{topics[0]}和{topics[1]} | {rng.choice(_ADJS)} {rng.choice(_NOUNS)} fan",
            location=rng.choice(_CITIES),
            followers=int(rng.paretovariate(1.2) * 50),
            post_count=self.posts_per_user,
            verified=rng.random() < 0.2,
        )

    # --- posts ----------------------------------------------------------------------------
    def post_number_of(self, pid: str) -> int | None:
        """`p7` -> 7, None for an id that is malformed or out of range."""
        return _parse("p", pid, self.total_posts)

    def post(self, pid: str) -> Post | None:
        n = _parse("p", pid, self.total_posts)
        return None if n is None else self._post(n)

    def _post(self, n: int) -> Post:
        """A post as served now: its likes moved by the change generator, when one is on."""
        post = self._base_post(n)
        if self.likes_gained is None:
            return post
        return dataclasses.replace(post, likes=post.likes + self.likes_gained(n))

    def post_number(self, i: int, k: int) -> int:
        return (i - 1) * self.posts_per_user + k + 1

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def _base_post(self, n: int) -> Post:
        i, k = divmod(n - 1, self.posts_per_user)
        i += 1
        rng = self._rng("post", n)
        topic = rng.choice(_TOPICS)
        title = (
            f"【{topic}】{rng.choice(_ADJS).capitalize()} {rng.choice(_NOUNS)} "
            f"{rng.choice(_VERBS)}{' & more' if rng.random() < 0.15 else ''}"
        )
        paragraphs = [
            " ".join(_sentence(rng) for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(2, 4))
        ]
        created = (
            BASE_TS - self.rank_of(i) * RANK_STEP_S - (self.posts_per_user - 1 - k) * POST_STEP_S
        )
        return Post(
            id=f"p{n}",
            user_id=f"u{i}",
            title=title,
            content="\n".join(paragraphs),
            likes=int(rng.paretovariate(1.1) * 10),
            comments_count=self.comments_per_post,
            created_at=created,
        )

    def user_posts(self, uid: str, offset: int, limit: int) -> list[Post]:
        """The user's posts newest first (statuses order)."""
        i = _parse("u", uid, self.users)
        if i is None:
            return []
        last = self.posts_per_user - 1
        ks = range(last - offset, max(last - offset - limit, -1), -1)
        return [self._post(self.post_number(i, k)) for k in ks]

    def with_author(self, post: Post, full: bool = False) -> dict[str, object]:
        """A post's JSON form with an embedded `user` {id, name}, as the APIs list it."""
        d = post.to_dict() if full else post.to_summary_dict()
        author = self.user(post.user_id)
        d["user"] = {"id": post.user_id, "name": author.name if author else ""}
        return d

    # --- feed -----------------------------------------------------------------------------
    def feed(self, offset: int, limit: int) -> list[Post]:
        """Feed entries: each user's newest post, ordered by rank (newest first)."""
        end = min(offset + limit, self.users)
        return [
            self._post(self.post_number(self.user_at_rank(r), self.posts_per_user - 1))
            for r in range(offset, end)
        ]

    # --- comments -------------------------------------------------------------------------
    def comment(self, cid: str) -> Comment | None:
        m = _parse("c", cid, self.total_comments)
        return None if m is None else self._comment(m)

    def _comment(self, m: int) -> Comment:
        n, j = divmod(m - 1, self.comments_per_post)
        n += 1
        rng = self._rng("comment", m)
        author = rng.randint(1, self.users)
        text = f"{rng.choice(_COMMENTS)}{ZH_COMMA}{rng.choice(_ZH_PHRASES)} {rng.choice(_NOUNS)}"
        if rng.random() < 0.5:
            text += f" {rng.choice(_COMMENTS)}"
        return Comment(
            id=f"c{m}",
            post_id=f"p{n}",
            user_id=f"u{author}",
            user_name=self._user(author).name,
            text=text,
            likes=int(rng.paretovariate(1.3) * 2),
            created_at=self._base_post(n).created_at + (j + 1) * COMMENT_STEP_S,
        )

    def post_comments(self, pid: str, offset: int, limit: int) -> list[Comment]:
        """The post's comments oldest first."""
        n = _parse("p", pid, self.total_posts)
        if n is None:
            return []
        end = min(offset + limit, self.comments_per_post)
        base = (n - 1) * self.comments_per_post
        return [self._comment(base + j + 1) for j in range(offset, end)]


def expected_counts(
    users: int,
    posts_per_user: int,
    comments_per_post: int,
    *,
    pc_feed_page_size: int = PC_FEED_PAGE_SIZE,
    pc_user_page_size: int = PC_USER_PAGE_SIZE,
    pc_comments_page_size: int = PC_COMMENTS_PAGE_SIZE,
    h5_feed_page_size: int = H5_FEED_PAGE_SIZE,
    h5_statuses_page_size: int = H5_STATUSES_PAGE_SIZE,
    h5_comments_page_size: int = H5_COMMENTS_PAGE_SIZE,
    app_page_size: int = APP_DEFAULT_SIZE,
    app_max_size: int = APP_MAX_SIZE,
    js_feed_page_size: int = JS_FEED_PAGE_SIZE,
    js_batch_size: int = JS_BATCH_SIZE,
) -> dict[str, object]:
    """Items of each type and pages (= requests) per endpoint for one full crawl per front end.

    `app_page_size` is the `size` the crawler sends; the server clamps it to `app_max_size`.
    Formulas are in demo/README.md ("Expected counts").
    """
    u, p, c = users, posts_per_user, comments_per_post
    s = min(max(app_page_size, 1), app_max_size)
    pc = {
        "feed_pages": page_count(u, pc_feed_page_size),
        "user_pages": u * page_count(p, pc_user_page_size),
        "post_pages": u * p,
        "comment_pages": u * p * page_count(c, pc_comments_page_size),
    }
    h5 = {
        "feed_pages": page_count(u, h5_feed_page_size),
        "profile_requests": u,
        "status_pages": u * page_count(p, h5_statuses_page_size),
        "detail_requests": u * p,
        "comment_pages": u * p * page_count(c, h5_comments_page_size),
    }
    app = {
        "feed_pages": page_count(u, s),
        "profile_requests": u,
        "status_pages": u * page_count(p, s),
        "detail_requests": u * p,
        "comment_pages": u * p * page_count(c, s),
    }
    for front in (pc, h5, app):
        front["requests"] = sum(front.values())
    batches = page_count(u, js_batch_size)
    js = {  # rendered in a browser: pages and the API calls their scripts make
        "feed_pages": page_count(u, js_feed_page_size),
        "batches": batches,
        "load_more_clicks": batches - 1,
        "post_pages": u * p,
    }
    return {
        "users": u,
        "posts": u * p,
        "comments": u * p * c,
        "feed_entries": u,
        "pc": pc,
        "h5": h5,
        "app": app,
        "js": js,
    }
