// The credential add form shows only the chosen kind's fields (the change page lists them server-side).
"use strict";
(function () {
  const FIELDS = {
    bearer: ["secret"],
    basic: ["username", "secret"],
    header: ["secret", "metadata"],
    oauth2: ["secret", "client_secret", "access_token", "metadata"],
  };
  const KIND_SPECIFIC = ["secret", "username", "client_secret", "access_token", "metadata"];
  function update(kind) {
    const shown = FIELDS[kind] || KIND_SPECIFIC;
    for (const name of KIND_SPECIFIC) {
      for (const row of document.querySelectorAll(".form-row.field-" + name)) {
        row.style.display = shown.includes(name) ? "" : "none";
      }
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    const select = document.getElementById("id_kind");
    if (select) {
      update(select.value);
      select.addEventListener("change", function () { update(select.value); });
    }
  });
})();
