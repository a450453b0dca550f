// DemoNews "js" front end: fills the page after `load` from /js/api/feed or window.__DATA__.
// Plain JavaScript, no build step. Markup matches the pc pages (demo/README.md, section 4a).
(function () {
  "use strict";

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function append(parent) {
    for (var i = 1; i < arguments.length; i++) {
      var part = arguments[i];
      parent.appendChild(typeof part === "string" ? document.createTextNode(part) : part);
    }
    return parent;
  }

  function iso(ts) {
    return new Date(ts * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
  }

  function timeEl(ts) {
    var stamp = iso(ts);
    return el("time", { "class": "created-at", datetime: stamp, "data-ts": String(ts) },
      stamp.replace("T", " ").slice(0, 16));
  }

  function meta(p) {
    return append(el("div", { "class": "meta" }),
      el("a", { "class": "user-link", href: "/pc/user/" + p.user_id }, p.user.name), " \u00b7 ",
      timeEl(p.created_at), " \u00b7 ",
      el("span", { "class": "likes" }, String(p.likes)), " \u8d5e \u00b7 ",
      el("span", { "class": "comments-count" }, String(p.comments_count)), " \u8bc4\u8bba");
  }

  function feedItem(p) {
    var item = el("div", { "class": "feed-item", "data-uid": p.user_id, "data-pid": p.id });
    var title = append(el("h2", { "class": "title" }),
      el("a", { "class": "post-link", href: "/js/post/" + p.id }, p.title));
    return append(item, title, meta(p), el("p", { "class": "summary" }, p.summary));
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status + " from " + url);
        return r.json();
      });
  }

  // Fetch one batch of the feed and append its entries to `section`.
  function loadBatch(section, offset, limit) {
    section.setAttribute("data-state", "loading");
    return getJSON("/js/api/feed?offset=" + offset + "&limit=" + limit).then(function (data) {
      data.list.forEach(function (p) { section.appendChild(feedItem(p)); });
      section.setAttribute("data-total", String(data.total));
      section.setAttribute("data-loaded", String(offset + data.list.length));
      section.setAttribute("data-state", data.has_more ? "more" : "done");
      return data;
    });
  }

  function failed(section, err) {
    section.setAttribute("data-state", "error");
    section.appendChild(el("p", { "class": "error" }, String(err)));
  }

  function end(section) {
    section.parentNode.insertBefore(el("p", { "class": "feed-end" }, "\u6ca1\u6709\u66f4\u591a\u4e86 No more"),
      section.nextSibling);
  }

  function pager(page, pages) {
    var div = el("div", { "class": "pager" });
    append(div, append(el("span", { "class": "page-info" }), "\u7b2c ",
      el("span", { "class": "current-page" }, String(page)), " / ",
      el("span", { "class": "total-pages" }, String(pages)), " \u9875"));
    if (page > 1) div.appendChild(el("a", { "class": "prev", href: "/js/feed?page=" + (page - 1) }, "\u4e0a\u4e00\u9875 Prev"));
    if (page < pages) div.appendChild(el("a", { "class": "next", href: "/js/feed?page=" + (page + 1) }, "\u4e0b\u4e00\u9875 Next"));
    return div;
  }

  var views = {
    // One page of the feed, fetched after load; then the pager.
    feed: function () {
      var section = document.getElementById("feed");
      var page = Number(section.dataset.page), pages = Number(section.dataset.totalPages);
      loadBatch(section, Number(section.dataset.offset), Number(section.dataset.limit))
        .then(function () {
          var loading = section.querySelector(".loading");
          if (loading) loading.remove();
          section.parentNode.insertBefore(pager(page, pages), section.nextSibling);
          section.setAttribute("data-state", "ready");
        })
        .catch(function (err) { failed(section, err); });
    },

    // The feed in batches behind a "load more" button, removed once everything is shown.
    more: function () {
      var section = document.getElementById("feed");
      var button = document.getElementById("load-more");
      var limit = Number(section.dataset.limit), offset = 0;
      function next() {
        button.disabled = true;
        return loadBatch(section, offset, limit).then(function (data) {
          offset += data.list.length;
          if (data.has_more) {
            button.hidden = false;
            button.disabled = false;
          } else {
            button.remove();
            end(section);
          }
        }).catch(function (err) { button.disabled = false; failed(section, err); });
      }
      button.addEventListener("click", next);
      next();
    },

    // The feed in batches, the next one fetched when the sentinel below the list scrolls into view.
    scroll: function () {
      var section = document.getElementById("feed");
      var sentinel = document.getElementById("sentinel");
      var limit = Number(section.dataset.limit), offset = 0, busy = false, done = false;
      function visible() {
        return sentinel.getBoundingClientRect().top < window.innerHeight;
      }
      function next() {
        if (busy || done) return;
        busy = true;
        loadBatch(section, offset, limit).then(function (data) {
          offset += data.list.length;
          busy = false;
          if (!data.has_more) {
            done = true;
            observer.disconnect();
            sentinel.remove();
            end(section);
          } else if (offset === data.list.length) {
            observer.observe(sentinel);  // the first batch is in: from now on, scrolling loads
          } else if (visible()) {
            next();  // the batch did not push the sentinel out of view
          }
        }).catch(function (err) { busy = false; failed(section, err); });
      }
      var observer = new IntersectionObserver(function (entries) {
        if (entries.some(function (e) { return e.isIntersecting; })) next();
      });
      next();
    },

    // A post whose fields come with the page, in window.__DATA__.
    post: function () {
      var p = window.__DATA__.post;
      var article = document.getElementById("post");
      article.setAttribute("data-pid", p.id);
      article.setAttribute("data-uid", p.user_id);
      var content = el("div", { "class": "post-content" });
      p.content.split("\n").forEach(function (par) { content.appendChild(el("p", {}, par)); });
      article.textContent = "";
      append(article, el("h1", { "class": "title" }, p.title), meta(p), content,
        el("a", { "class": "comments-link", href: "/pc/post/" + p.id + "/comments?page=1" },
          "\u67e5\u770b\u8bc4\u8bba View comments (" + p.comments_count + ")"));
      article.setAttribute("data-state", "ready");
    }
  };

  window.addEventListener("load", function () {
    var view = views[document.body.dataset.view];
    if (view) view();
  });
})();
