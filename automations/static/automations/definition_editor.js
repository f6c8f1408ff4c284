/* The definition field's editor: JSONEditor (shipped by django-json-widget, served from the
 * installed app: no CDN) in code mode, checking the text against the definition's JSON schema
 * as you type. The textarea stays the form's field: without JavaScript (or if the editor cannot
 * start) it is what you edit; with it, the editor writes every change back into it, and a
 * script that sets the textarea (and fires "input" or "change") updates the editor. The server
 * validates on save either way and shows its errors inline. */
(function () {
  "use strict";

  function start(container) {
    var textarea = document.getElementById(container.dataset.textarea);
    var schemaNode = document.getElementById(container.dataset.schema);
    if (!textarea || typeof window.JSONEditor !== "function") {
      return;
    }
    var options = {
      mode: "code",
      modes: ["code", "tree", "text"],
      indentation: 2,
      mainMenuBar: true,
      statusBar: true,
      onChangeText: function (text) {
        textarea.value = text;
      },
    };
    if (schemaNode) {
      options.schema = JSON.parse(schemaNode.textContent);
    }
    var editor;
    try {
      container.hidden = false;
      editor = new window.JSONEditor(container, options);
      editor.setText(textarea.value);
    } catch (error) {
      container.hidden = true;
      console.error("definition editor unavailable, using the plain textarea", error);
      return;
    }
    textarea.style.display = "none";
    var fromTextarea = function () {
      if (editor.getText() !== textarea.value) {
        editor.updateText(textarea.value);
      }
    };
    textarea.addEventListener("input", fromTextarea);
    textarea.addEventListener("change", fromTextarea);
    if (textarea.form) {
      // Whatever changed the editor (typing, or its API), the form sends what it shows.
      textarea.form.addEventListener("submit", function () {
        textarea.value = editor.getText();
      });
    }
    container.jsonEditor = editor;
  }

  function startAll() {
    document.querySelectorAll(".definition-editor[data-textarea]").forEach(start);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", startAll);
  } else {
    startAll();
  }
})();
